// Command conformance checks Kontinuum's generated Talos artifacts with Talos's
// own machinery: the secrets bundle loader and the metal-mode config validator.
// Python generates the inputs; this program only judges them, so a drift between
// our renderer and the pinned Talos contract shows up as a failing test.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v4"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

// metalMode mirrors machined's "metal" runtime mode, which lives in an internal
// package that cannot be imported from outside the Talos module.
type metalMode struct{}

func (metalMode) String() string        { return "metal" }
func (metalMode) RequiresInstall() bool { return true }
func (metalMode) InContainer() bool     { return false }

type fileList []string

func (l *fileList) String() string     { return strings.Join(*l, ",") }
func (l *fileList) Set(v string) error { *l = append(*l, v); return nil }

// result is one verdict; Error carries machinery's own text so callers can
// compare the field it names with our precheck.
type result struct {
	Kind     string   `json:"kind"`
	File     string   `json:"file"`
	OK       bool     `json:"ok"`
	Error    string   `json:"error,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

func checkSecrets(path string) result {
	r := result{Kind: "secrets", File: path}

	bundle, err := secrets.LoadBundle(path)
	if err == nil {
		err = bundle.Validate()
	}

	if err != nil {
		r.Error = err.Error()

		return r
	}

	// talosctl writes secrets.yaml with yaml.Marshal of this same struct; re-marshalling
	// proves our file is byte-identical to what talosctl would have written.
	original, err := os.ReadFile(path)
	if err != nil {
		r.Error = err.Error()

		return r
	}

	remarshalled, err := yaml.Marshal(bundle)
	if err != nil {
		r.Error = "marshal: " + err.Error()

		return r
	}

	if string(remarshalled) != string(original) {
		r.Error = "not byte-identical to talosctl's encoding of the same bundle"

		return r
	}

	r.OK = true

	return r
}

func checkConfig(kind, path string) result {
	r := result{Kind: kind, File: path}

	data, err := os.ReadFile(path)
	if err != nil {
		r.Error = err.Error()

		return r
	}

	provider, err := configloader.NewFromBytes(data)
	if err != nil {
		r.Error = "load: " + err.Error()

		return r
	}

	warnings, err := provider.Validate(metalMode{}, validation.WithLocal(), validation.WithStrict())
	r.Warnings = warnings

	if err != nil {
		r.Error = err.Error()
	} else {
		r.OK = true
	}

	return r
}

func main() {
	var good, bad, secretFiles fileList

	flag.Var(&secretFiles, "secrets", "talosctl-format secrets.yaml expected to load and validate (repeatable)")
	flag.Var(&good, "good", "machine config expected to pass metal-mode strict validation (repeatable)")
	flag.Var(&bad, "bad", "machine config expected to be rejected (repeatable)")
	flag.Parse()

	var results []result

	for _, f := range secretFiles {
		results = append(results, checkSecrets(f))
	}

	for _, f := range good {
		results = append(results, checkConfig("good", f))
	}

	for _, f := range bad {
		results = append(results, checkConfig("bad", f))
	}

	failed := 0

	for _, r := range results {
		expectOK := r.Kind != "bad"
		verdict := "PASS"

		if r.OK != expectOK {
			verdict = "FAIL"
			failed++
		}

		status := "accepted"
		if !r.OK {
			status = "rejected: " + strings.ReplaceAll(r.Error, "\n", " ")
		}

		fmt.Fprintf(os.Stderr, "%s %-7s %s %s\n", verdict, r.Kind, r.File, status)
	}

	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")

	if err := enc.Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	if failed > 0 {
		os.Exit(1)
	}
}
