package main

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
)

// A child with a parent-death signal outlives threads that this process
// ends, as the local provider's exec launcher ends the locked thread it
// ran on (startTied). Started plainly, from whatever thread the test ran
// on, the child is killed as soon as a goroutine locks that thread and
// exits.
func TestStartTiedOutlivesEndedThreads(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startTied(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for range 500 {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			close(done)
		}()
		<-done
	}
	select {
	case err := <-exited:
		t.Fatalf("the child died when threads of this process ended: %v", err)
	default:
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the child is gone: %v", err)
	}
}
