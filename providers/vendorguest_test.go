package providers_test

import (
	"slices"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/providers"
)

// proxyLog records the registrations a vendor provider makes.
type proxyLog struct{ registered, unregistered []string }

func (l *proxyLog) Register(ws egress.Workspace) (string, error) {
	l.registered = append(l.registered, ws.ID)
	return "cred-" + ws.ID, nil
}

func (l *proxyLog) Unregister(id string) { l.unregistered = append(l.unregistered, id) }

// RegisterVendorEgress hands back the undo of what it registered, and an
// undo that does nothing when it registered nothing.
func TestRegisterVendorEgressUndo(t *testing.T) {
	reg := &proxyLog{}
	ve, err := providers.NewVendorEgress("https://proxy.sg.test:8443", nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	spec := providers.CreateSpec{WorkspaceID: "ws-1", Egress: sandgate.EgressPolicy{AllowedDomains: []string{"example.com"}}}
	cred, unregister, err := providers.RegisterVendorEgress(ve, spec)
	if err != nil || cred != "cred-ws-1" || !slices.Equal(reg.registered, []string{"ws-1"}) {
		t.Fatalf("register: %q, %v; registered %v", cred, err, reg.registered)
	}
	unregister()
	if !slices.Equal(reg.unregistered, []string{"ws-1"}) {
		t.Errorf("after the undo, unregistered %v; want ws-1", reg.unregistered)
	}

	cred, unregister, err = providers.RegisterVendorEgress(ve, providers.CreateSpec{WorkspaceID: "ws-2"})
	if err != nil || cred != "" || len(reg.registered) != 1 {
		t.Fatalf("register with no domains: %q, %v; registered %v", cred, err, reg.registered)
	}
	unregister()
	if len(reg.unregistered) != 1 {
		t.Errorf("the undo of no registration unregistered %v", reg.unregistered)
	}
	if _, _, err := providers.RegisterVendorEgress(nil, spec); err == nil {
		t.Errorf("domains without a proxy for vendor guests: no error")
	}
}
