package flymachines

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandgate/sandgate/providers"
)

// Listing. Every Machine's config carries the agent (config.files, about
// 8 MB of base64 for a 6 MB agent), and Fly echoes the config in each
// Machine of a list: a full list of 30 Machines would be a quarter of a
// gigabyte, every reaper pass. So the list asks for summaries (sheet
// §1.3: summary omits config and events) and each Machine's labels come
// from its metadata alone (GET …/metadata, a small map, rate-limited per
// Machine), read once for a Machine whose labels no longer change: a
// workspace's. A pooled Machine's are read on every list, since a take
// relabels it. Should a Fly ignore summary, the config's metadata is used
// as it comes and nothing more is asked.

// list lists the app's Machines carrying this broker's metadata (and the
// extra filters). Every metadata.KEY=VALUE must match. The app list's
// pagination is not in the sheet: an array answer is the whole list, and
// an object answer {machines, next_cursor} is followed by its cursor.
func (p *Provider) list(ctx context.Context, extra url.Values) ([]Machine, error) {
	return p.listBroker(ctx, p.brokerID, extra)
}

// listBroker is list for the Machines of broker id. Each Machine returned
// has its metadata (in Config, when the answer had none).
func (p *Provider) listBroker(ctx context.Context, id string, extra url.Values) ([]Machine, error) {
	q := url.Values{"metadata." + providers.LabelBroker: {id}, "summary": {"true"}}
	for k, v := range extra {
		q[k] = v
	}
	var out []Machine
	seen := map[string]bool{}
	for page := 0; ; page++ {
		if page > 1000 {
			return nil, errors.New("fly: list machines: too many pages")
		}
		cctx, cancel := p.callCtx(ctx)
		var raw rawAnswer
		err := p.c.call(cctx, "list machines", http.MethodGet, p.appPath()+"/machines", q, nil, &raw)
		cancel()
		if err != nil {
			return nil, err
		}
		ms, next, err := decodeMachines(raw.body)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if m.State == "destroyed" || m.State == "destroying" {
				continue
			}
			md := m.metadata()
			if md == nil {
				md, err = p.metadata(ctx, m.ID)
				if statusIs(err, http.StatusNotFound) {
					continue // destroyed since the list
				}
				if err != nil {
					return nil, err
				}
				m.Config = &MachineConfig{Metadata: md}
			}
			if md[providers.LabelBroker] != id {
				continue
			}
			seen[m.ID] = true
			ok := true
			for k, v := range extra {
				if key, isMD := strings.CutPrefix(k, "metadata."); isMD && md[key] != v[0] {
					ok = false
				}
			}
			if ok {
				out = append(out, m)
			}
		}
		if next == "" {
			if len(extra) == 0 {
				p.mdCache.keepOnly(id, seen)
			}
			return out, nil
		}
		q.Set("cursor", next)
	}
}

// metadata returns the metadata of Machine id: from the cache when it is
// a workspace's, else read from Fly (and cached when it is).
func (p *Provider) metadata(ctx context.Context, id string) (map[string]string, error) {
	if md, ok := p.mdCache.get(id); ok {
		return md, nil
	}
	cctx, cancel := p.callCtx(ctx)
	defer cancel()
	var md map[string]string
	if err := p.c.call(cctx, "get metadata", http.MethodGet, p.machinePath(id)+"/metadata", nil, nil, &md); err != nil {
		return nil, err
	}
	if md == nil {
		md = map[string]string{}
	}
	if md[providers.LabelWorkspace] != "" && md[labelPool] == "" {
		p.mdCache.put(id, md)
	}
	return md, nil
}

// labelCache holds the metadata of the Machines whose labels no longer
// change: a workspace's (not a pooled Machine's, which a take relabels).
// An entry goes when its Machine is terminated or a full list of its
// broker no longer has it, so the cache holds at most the live Machines.
type labelCache struct{ byMachine[map[string]string] }

// keepOnly drops the entries of broker's Machines that are not in live.
func (c *labelCache) keepOnly(broker string, live map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, md := range c.m {
		if md[providers.LabelBroker] == broker && !live[id] {
			delete(c.m, id)
		}
	}
}
