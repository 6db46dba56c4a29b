package tools

import (
	"reflect"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
)

// outputSchema is mcp.WithOutputSchema[T] with one spelling of each type.
// The generator gives every slice, map and pointer field the type
// ["null", X], as Go's nil marshals to null; clients that map tool
// schemas onto a single-type dialect (the OpenAPI subset of Gemini
// function declarations, for one) reject or mangle such a field. So the
// schema says X alone, and structured (below) keeps the promise: an
// optional field that is empty is absent (omitempty), a required one is
// empty, never null.
func outputSchema[T any]() mcp.ToolOption {
	generated := mcp.WithOutputSchema[T]()
	return func(t *mcp.Tool) {
		generated(t)
		for _, p := range t.OutputSchema.Properties {
			singleTypes(p)
		}
		for _, d := range t.OutputSchema.Defs {
			singleTypes(d)
		}
	}
}

// singleTypes rewrites, in a decoded schema, every "type": ["null", X]
// as "type": X.
func singleTypes(node any) {
	switch n := node.(type) {
	case map[string]any:
		if ts, ok := n["type"].([]any); ok {
			rest := slices.DeleteFunc(slices.Clone(ts), func(t any) bool { return t == "null" })
			if len(rest) == 1 && len(ts) == 2 {
				n["type"] = rest[0]
			}
		}
		for _, v := range n {
			singleTypes(v)
		}
	case []any:
		for _, v := range n {
			singleTypes(v)
		}
	}
}

// structured is mcp.NewToolResultStructured with out's required slices
// and maps made empty where they are nil, at any depth, so that the result
// matches outputSchema's promise of no nulls.
func structured(out any, text string) *mcp.CallToolResult {
	return mcp.NewToolResultStructured(noNulls(out), text)
}

// noNulls returns a copy of v whose nil slices and maps, in fields without
// omitempty, are empty.
func noNulls(v any) any {
	c := reflect.New(reflect.TypeOf(v)).Elem()
	c.Set(reflect.ValueOf(v))
	fillNils(c)
	return c.Interface()
}

func fillNils(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			fillNils(v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			fillNils(v.Index(i))
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f, fv := t.Field(i), v.Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			optional := slices.Contains(strings.Split(tag, ",")[1:], "omitempty")
			switch {
			case fv.Kind() == reflect.Slice && fv.IsNil() && !optional && fv.CanSet():
				fv.Set(reflect.MakeSlice(fv.Type(), 0, 0))
			case fv.Kind() == reflect.Map && fv.IsNil() && !optional && fv.CanSet():
				fv.Set(reflect.MakeMap(fv.Type()))
			default:
				fillNils(fv)
			}
		}
	}
}
