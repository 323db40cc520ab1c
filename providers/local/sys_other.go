//go:build !linux

package local

import (
	"os"
	"os/exec"
	"syscall"

	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// The local provider needs Linux namespaces; elsewhere New refuses and
// these stubs only keep the package compiling.

const supported = false

func hostCPUs() ([]int, error)           { return nil, errUnsupported }
func startPinned(*exec.Cmd, []int) error { return errUnsupported }
func closeOnExec() error                 { return errUnsupported }
func killGroup(int) error                { return errUnsupported }
func killExec(int) error                 { return errUnsupported }

func sandboxProcAttr(int) *syscall.SysProcAttr { return nil }
func stage(stepOptions) error                  { return errUnsupported }
func jobLimits(job) []step.Rlimit              { return nil }

const selfExe = ""

func waitExited(int) error                   { return errUnsupported }
func rootTreesWork() bool                    { return false }
func pinHere([]int) func()                   { return nil }
func seccompFilter() []byte                  { return nil }
func flock(int, int) error                   { return errUnsupported }
func procStart(int) (uint64, error)          { return 0, errUnsupported }
func memfd(string, []byte) (*os.File, error) { return nil, errUnsupported }
func durableProcAttr() *syscall.SysProcAttr  { return nil }

const (
	lockShared    = 1
	lockExclusive = 2
	lockNonBlock  = 4
	lockUnlock    = 8
)

var errWouldBlock = errUnsupported

func killPid(int) error { return errUnsupported }
