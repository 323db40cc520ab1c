package broker

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// envPrefix starts every config override.
const envPrefix = "SANDGATE_"

// envAliases are older names of overrides, still read when the generated
// name is unset: the generated name wins.
var envAliases = map[string]string{
	"SANDGATE_PROVIDER_NAME": "SANDGATE_PROVIDER",
}

// envField is one config field and its environment override.
type envField struct {
	// Env is SANDGATE_ and the field's YAML path, upper-cased, with each
	// dot an underscore: admission.risk.max_size is
	// SANDGATE_ADMISSION_RISK_MAX_SIZE.
	Env string
	// Path is the field's YAML path (admission.risk.max_size).
	Path  string
	index []int
	typ   reflect.Type
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	nodeType     = reflect.TypeFor[yaml.Node]()
)

// envFields lists every field of Config that YAML sets, each with its
// override: the leaves, and every list, map or free-form block (provider
// settings) as a whole. It is derived from the struct, so a new field gets
// an override without a line of code.
func envFields() []envField {
	var out []envField
	var walk func(t reflect.Type, path string, index []int)
	walk = func(t reflect.Type, path string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			idx := append(append([]int(nil), index...), i)
			if f.Type.Kind() == reflect.Struct && f.Type != nodeType {
				walk(f.Type, p, idx)
				continue
			}
			env := envPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(p))
			out = append(out, envField{Env: env, Path: p, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// applyEnv sets every field whose override (or its alias) is non-empty. A
// string takes the value as it is; anything else is parsed as YAML, as in
// the file: "30s", "5", "true", "[10.0.0.0/8]", "{read: {per_second: 5}}".
// An error names the variable and the field's type, never the value (it
// may be a password).
func applyEnv(c *Config, getenv func(string) string) error {
	root := reflect.ValueOf(c).Elem()
	for _, f := range envFields() {
		name := f.Env
		v := getenv(name)
		if v == "" && envAliases[name] != "" {
			name = envAliases[name]
			v = getenv(name)
		}
		if v == "" {
			continue
		}
		dst := root.FieldByIndex(f.index)
		if f.typ.Kind() == reflect.String {
			dst.SetString(v)
			continue
		}
		if err := decodeEnv(v, dst); err != nil {
			return fmt.Errorf("config: %s (%s): not a valid %s", name, f.Path, typeName(f.typ))
		}
	}
	return nil
}

// decodeEnv parses v as YAML into dst, strictly (unknown keys are errors).
func decodeEnv(v string, dst reflect.Value) error {
	if dst.Type() == nodeType {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(v), &doc); err != nil {
			return err
		}
		if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
			return fmt.Errorf("want a mapping")
		}
		dst.Set(reflect.ValueOf(*doc.Content[0]))
		return nil
	}
	p := reflect.New(dst.Type())
	dec := yaml.NewDecoder(bytes.NewReader([]byte(v)))
	dec.KnownFields(true)
	if err := dec.Decode(p.Interface()); err != nil {
		return err
	}
	dst.Set(p.Elem())
	return nil
}

// typeName is how an override's error and the README name a field's type.
func typeName(t reflect.Type) string {
	if s, ok := reflect.Zero(t).Interface().(interface{ envSyntax() string }); ok {
		return s.envSyntax()
	}
	switch {
	case t == durationType:
		return "duration (Go syntax: 30s, 2m)"
	case t == nodeType:
		return "YAML mapping"
	case t.Kind() == reflect.Slice:
		return "YAML list"
	case t.Kind() == reflect.Map:
		return "YAML mapping"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() == reflect.Float64:
		return "number"
	}
	return t.Kind().String()
}
