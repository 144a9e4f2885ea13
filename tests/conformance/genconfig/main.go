// Command genconfig prints what Talos's own generator (`talosctl gen config`, the pinned
// pkg/machinery) makes for given inputs, so a test can compare the structure of Kontinuum's
// rendered configs with it: patches written for talosctl-made configs must apply to ours.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
)

func main() {
	name := flag.String("name", "conformance", "cluster name")
	endpoint := flag.String("endpoint", "https://127.0.0.10:6443", "control-plane endpoint")
	k8s := flag.String("kubernetes-version", "1.35.4", "Kubernetes version")
	disk := flag.String("install-disk", "/dev/sda", "install disk")
	flag.Parse()

	input, err := generate.NewInput(*name, *endpoint, *k8s, generate.WithInstallDisk(*disk))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	out := map[string]string{}

	for key, t := range map[string]machine.Type{"controlplane": machine.TypeControlPlane, "worker": machine.TypeWorker} {
		provider, err := input.Config(t)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}

		// talosctl gen config --with-docs=false --with-examples=false
		data, err := provider.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}

		out[key] = string(data)
	}

	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
