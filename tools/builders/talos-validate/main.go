// Command kontinuum-talos-validate judges rendered Talos machine configs with Talos's own
// machinery (the pinned pkg/machinery: config loader + strict metal-mode validator).
//
// Input on stdin: a JSON list of {"name": ..., "config": "<yaml>"}; output on stdout: a JSON
// list of {"name", "ok", "error", "warnings"} in the same order. One process judges a whole
// stack, so the cost is paid once per `pulumi preview`, not once per node.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

// version is stamped by tools/install.sh with the machinery version the module pins.
var version = "dev"

// metalMode mirrors machined's "metal" runtime mode, which lives in an internal package.
type metalMode struct{}

func (metalMode) String() string        { return "metal" }
func (metalMode) RequiresInstall() bool { return true }
func (metalMode) InContainer() bool     { return false }

type input struct {
	Name   string `json:"name"`
	Config string `json:"config"`
}

type verdict struct {
	Name     string   `json:"name"`
	OK       bool     `json:"ok"`
	Error    string   `json:"error,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

func judge(in input) verdict {
	v := verdict{Name: in.Name}

	provider, err := configloader.NewFromBytes([]byte(in.Config))
	if err != nil {
		v.Error = "load: " + err.Error()

		return v
	}

	warnings, err := provider.Validate(metalMode{}, validation.WithLocal(), validation.WithStrict())
	v.Warnings = warnings

	if err != nil {
		v.Error = err.Error()
	} else {
		v.OK = true
	}

	return v
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println(version)

		return
	}

	var inputs []input
	if err := json.NewDecoder(os.Stdin).Decode(&inputs); err != nil {
		fmt.Fprintln(os.Stderr, "kontinuum-talos-validate: stdin must be a JSON list of {name, config}:", err)
		os.Exit(2)
	}

	out := make([]verdict, 0, len(inputs))
	for _, in := range inputs {
		out = append(out, judge(in))
	}

	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "kontinuum-talos-validate:", err)
		os.Exit(1)
	}
}
