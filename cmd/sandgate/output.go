package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/spf13/cobra"
)

// Every command takes -o json (its answer as JSON, for scripts) and -q
// (quiet: only the ids of what it created or listed, one a line, or
// nothing). They are the root's persistent flags, read where a command
// prints (emit). -q wins over -o json; errors go to stderr either way.
// Data the command was asked for (exec's output, a file, an export) is
// not an answer to silence: it is written either way.

// outputHelp is the root's help text on -o and -q.
const outputHelp = `Output: every command takes -o json (its answer as JSON) and -q (quiet:
only the ids of what it created or listed, one a line, or nothing on
success; -q wins over -o json). Data a command was asked for (a command's
output, a file's contents, an export's rows) is written either way.
Errors always go to stderr.`

// addOutputFlags adds -o and -q to root and every command under it, and
// refuses an unknown -o before a command runs.
func addOutputFlags(root *cobra.Command) {
	root.PersistentFlags().StringP("output", "o", "", "output format: table (default) or json")
	root.PersistentFlags().BoolP("quiet", "q", false, "print only the ids of what the command created or listed, or nothing")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		_, err := outputOf(cmd)
		return err
	}
}

// output is how a command prints its answer.
type output struct {
	json  bool // -o json
	quiet bool // -q
}

// text reports whether the command prints its plain text form.
func (o output) text() bool { return !o.json && !o.quiet }

// outputOf reads -o and -q of the running command.
func outputOf(cmd *cobra.Command) (output, error) {
	format, _ := cmd.Flags().GetString("output")
	quiet, _ := cmd.Flags().GetBool("quiet")
	o := output{quiet: quiet}
	switch format {
	case "", "text", "table":
	case "json":
		o.json = true
	default:
		return o, usageErr(fmt.Errorf("-o %q: want table or json", format))
	}
	return o, nil
}

// emit prints a command's answer v: its ids with -q, v as JSON with
// -o json, else plain on a line of its own (nothing when plain is "").
func emit(cmd *cobra.Command, v any, plain string) error {
	o, err := outputOf(cmd)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	switch {
	case o.quiet:
		if ids := quietIDs(reflect.ValueOf(v)); len(ids) > 0 {
			_, err = fmt.Fprintln(w, strings.Join(ids, "\n"))
		}
	case o.json:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		err = enc.Encode(v)
	case plain != "":
		_, err = fmt.Fprintln(w, plain)
	}
	return err
}

// quietIDs are what -q prints of v: a minted token (shown once, so it is
// the answer), else the ID of a struct, of each item of a list, or of
// each item of a struct's lists (a page of workspaces).
func quietIDs(v reflect.Value) []string {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		var out []string
		for i := range v.Len() {
			out = append(out, quietIDs(v.Index(i))...)
		}
		return out
	case reflect.Struct:
		for _, name := range []string{"Token", "ID"} {
			if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
				return []string{f.String()}
			}
		}
		var out []string
		for i := range v.NumField() {
			if f := v.Field(i); v.Type().Field(i).IsExported() && f.Kind() == reflect.Slice {
				out = append(out, quietIDs(f)...)
			}
		}
		return out
	}
	return nil
}
