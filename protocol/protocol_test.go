package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

func TestCommandStatusJSON(t *testing.T) {
	zero, seven := 0, 7
	for _, tt := range []struct {
		in   protocol.CommandStatus
		want string
	}{
		{protocol.CommandStatus{State: protocol.CommandUnknown}, `{"state":"unknown"}`},
		{protocol.CommandStatus{State: protocol.CommandCanceled}, `{"state":"canceled"}`},
		{protocol.CommandStatus{State: protocol.CommandCompleted, ExitCode: &zero},
			`{"state":"completed","exit_code":0,"stdout_b64":"","stderr_b64":"","output_truncated":false,"stdout_bytes":0,"stderr_bytes":0,"timed_out":false}`},
		{protocol.CommandStatus{State: protocol.CommandCompleted, ExitCode: &seven, StdoutB64: "aGk=", OutputTruncated: true, StdoutBytes: 9},
			`{"state":"completed","exit_code":7,"stdout_b64":"aGk=","stderr_b64":"","output_truncated":true,"stdout_bytes":9,"stderr_bytes":0,"timed_out":false}`},
	} {
		b, err := json.Marshal(tt.in)
		if err != nil || string(b) != tt.want {
			t.Errorf("json.Marshal(%+v) = %s, %v; want %s", tt.in, b, err, tt.want)
		}
		var back protocol.CommandStatus
		if err := json.Unmarshal(b, &back); err != nil || back.State != tt.in.State || (back.ExitCode == nil) != (tt.in.ExitCode == nil) {
			t.Errorf("json.Unmarshal(%s) = %+v, %v; want %+v", b, back, err, tt.in)
		}
	}
}
