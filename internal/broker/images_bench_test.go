package broker

import (
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/providers"
)

// BenchmarkImageFirstCommand times a create and its first command (`sh -c :`)
// on the host image and on a cached OCI image (docs/benchmarks.md).
//
//	go test -run '^$' -bench ImageFirstCommand -benchtime 20x ./internal/broker/
func BenchmarkImageFirstCommand(b *testing.B) {
	e := newImageEnv(b, 0)
	ref := e.push(b, "bench/busybox", imagestest.Image(b, v1.Config{}, imagestest.BusyboxLayer(b, "bench")))
	if _, release, err := e.store.s.Acquire(b.Context(), ref); err != nil {
		b.Fatal(err)
	} else {
		release() // cached from here on
	}
	for _, c := range []struct{ name, image string }{{"host", ""}, {"image", ref}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				sb, err := e.create(b, c.image)
				if err != nil {
					b.Fatal(err)
				}
				res, err := e.provider.Exec(b.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", ":"}})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("exec: %v, %+v", err, res)
				}
				b.StopTimer()
				e.provider.Terminate(b.Context(), sb)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkImageFirstPull times the first pull of a 100 MB image from a
// loopback registry, create and first command included (-benchtime 1x).
func BenchmarkImageFirstPull(b *testing.B) {
	e := newImageEnv(b, 0)
	ref := e.push(b, "bench/big", imagestest.Image(b, v1.Config{},
		imagestest.BusyboxLayer(b, "big"), imagestest.RandomLayer(b, 100<<20)))
	for b.Loop() {
		start := time.Now()
		sb, err := e.create(b, ref)
		if err != nil {
			b.Fatal(err)
		}
		res, err := e.provider.Exec(b.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", ":"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v, %+v", err, res)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/first-pull")
		b.StopTimer()
		e.provider.Terminate(b.Context(), sb)
		e.store.s.Remove(b.Context(), ref)
		b.StartTimer()
	}
}
