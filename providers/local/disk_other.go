//go:build !linux

package local

import "context"

// Disk quotas need Linux; New refuses elsewhere.

type diskHost struct{}

func detectDisk() (*diskHost, string)                                  { return nil, "disk: needs Linux" }
func (*diskHost) create(context.Context, layout, int, int, bool) error { return errUnsupported }
func (p *Provider) admitDisk(context.Context, int) (func(), error) {
	return nil, errUnsupported
}
