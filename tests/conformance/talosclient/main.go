// Command talosclient drives a Kontinuum Talos node emulator with Talos's own
// Go client (pkg/machinery/client), the way talosctl would, so the emulator's
// wire behaviour is checked against the real implementation rather than ours.
//
// It exits non-zero, naming the failed step, on the first deviation.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

const callTimeout = 10 * time.Second

func main() {
	endpoint := flag.String("endpoint", "", "emulated node address (dialled at :50000)")
	configPath := flag.String("config", "", "machine config to apply in maintenance mode")
	talosconfigPath := flag.String("talosconfig", "", "talosconfig for the configured node")
	waitFor := flag.Duration("wait", 30*time.Second, "bound for the node to come up configured or back in maintenance")
	flag.Parse()

	if *endpoint == "" || *configPath == "" || *talosconfigPath == "" {
		fail("usage", errors.New("-endpoint, -config and -talosconfig are required"))
	}

	if err := run(*endpoint, *configPath, *talosconfigPath, *waitFor); err != nil {
		fail("conformance", err)
	}

	fmt.Println("OK")
}

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", step, err)
	os.Exit(1)
}

func step(name string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	started := time.Now()

	if err := fn(ctx); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}

	fmt.Printf("ok %-32s %s\n", name, time.Since(started).Round(time.Millisecond))

	return nil
}

// poll retries fn until it succeeds or the bound passes: the emulator, like a
// real node, needs a reboot before it answers in its new mode.
func poll(name string, bound time.Duration, fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(bound)

	for {
		err := step(name, fn)
		if err == nil {
			return nil
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s: %w", bound, err)
		}

		time.Sleep(200 * time.Millisecond)
	}
}

func maintenanceClient(endpoint string) (*client.Client, error) {
	// The same options talosctl --insecure uses: server-only TLS, no verification.
	return client.New(context.Background(),
		client.WithEndpoints(endpoint),
		client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true}), //nolint:gosec
	)
}

func run(endpoint, configPath, talosconfigPath string, waitFor time.Duration) error {
	configData, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}

	insecure, err := maintenanceClient(endpoint)
	if err != nil {
		return err
	}
	defer insecure.Close() //nolint:errcheck

	if err = step("maintenance version is unimplemented", func(ctx context.Context) error {
		_, err := insecure.Version(ctx)
		if status.Code(err) != codes.Unimplemented {
			return fmt.Errorf("want Unimplemented, got %v", err)
		}

		return nil
	}); err != nil {
		return err
	}

	// What `talosctl -i get version` and `get links` do: COSI reads, decoded by machinery's
	// registered resource types.
	if err = step("maintenance COSI get version", func(ctx context.Context) error {
		v, err := safe.StateGetByID[*runtime.Version](ctx, insecure.COSI, "version")
		if err != nil {
			return err
		}

		if v.TypedSpec().Version == "" {
			return errors.New("empty version in the decoded spec")
		}

		fmt.Printf("   talos %s\n", v.TypedSpec().Version)

		return nil
	}); err != nil {
		return err
	}

	if err = step("maintenance COSI list links", func(ctx context.Context) error {
		links, err := safe.StateListAll[*network.LinkStatus](ctx, insecure.COSI)
		if err != nil {
			return err
		}

		if links.Len() == 0 {
			return errors.New("no links listed")
		}

		return nil
	}); err != nil {
		return err
	}

	if err = step("maintenance no-reboot is refused", func(ctx context.Context) error {
		_, err := insecure.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data: configData,
			Mode: machine.ApplyConfigurationRequest_NO_REBOOT,
		})
		if status.Code(err) != codes.Unimplemented {
			return fmt.Errorf("want Unimplemented, got %v", err)
		}

		return nil
	}); err != nil {
		return err
	}

	if err = step("maintenance apply-config", func(ctx context.Context) error {
		_, err := insecure.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data: configData,
			Mode: machine.ApplyConfigurationRequest_AUTO,
		})

		return err
	}); err != nil {
		return err
	}

	c, err := client.New(context.Background(), client.WithConfigFromFile(talosconfigPath))
	if err != nil {
		return err
	}
	defer c.Close() //nolint:errcheck

	if err = poll("version (mTLS)", waitFor, func(ctx context.Context) error {
		resp, err := c.Version(client.WithNodes(ctx, endpoint))
		if err != nil {
			return err
		}

		if len(resp.Messages) != 1 || resp.Messages[0].Version.GetTag() == "" {
			return fmt.Errorf("unexpected reply %v", resp)
		}

		if resp.Messages[0].Metadata.GetHostname() != endpoint {
			return fmt.Errorf("metadata.hostname %q, want %q", resp.Messages[0].Metadata.GetHostname(), endpoint)
		}

		fmt.Printf("   version %s\n", resp.Messages[0].Version.Tag)

		return nil
	}); err != nil {
		return err
	}

	if err = step("bootstrap", func(ctx context.Context) error {
		return c.Bootstrap(client.WithNode(ctx, endpoint), &machine.BootstrapRequest{})
	}); err != nil {
		return err
	}

	if err = step("second bootstrap is refused", func(ctx context.Context) error {
		// Talos: AlreadyExists "etcd data directory is not empty".
		err := c.Bootstrap(client.WithNode(ctx, endpoint), &machine.BootstrapRequest{})
		if status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("want AlreadyExists, got %v", err)
		}

		return nil
	}); err != nil {
		return err
	}

	if err = step("kubeconfig", func(ctx context.Context) error {
		kubeconfig, err := c.Kubeconfig(client.WithNode(ctx, endpoint))
		if err != nil {
			return err
		}

		for _, want := range []string{"apiVersion: v1", "kind: Config", "client-certificate-data", "server: https://"} {
			if !strings.Contains(string(kubeconfig), want) {
				return fmt.Errorf("kubeconfig lacks %q", want)
			}
		}

		return nil
	}); err != nil {
		return err
	}

	if err = step("etcd member list", func(ctx context.Context) error {
		resp, err := c.EtcdMemberList(client.WithNodes(ctx, endpoint), &machine.EtcdMemberListRequest{})
		if err != nil {
			return err
		}

		if len(resp.Messages) != 1 || len(resp.Messages[0].Members) != 1 {
			return fmt.Errorf("want one member, got %v", resp)
		}

		m := resp.Messages[0].Members[0]
		if m.Id == 0 || m.Hostname == "" || len(m.PeerUrls) == 0 {
			return fmt.Errorf("incomplete member %v", m)
		}

		return nil
	}); err != nil {
		return err
	}

	if err = upgradeK8sCalls(c, endpoint); err != nil {
		return err
	}

	if err = upgrade(c, endpoint, waitFor); err != nil {
		return err
	}

	if err = step("reset", func(ctx context.Context) error {
		return c.Reset(client.WithNodes(ctx, endpoint), false, true)
	}); err != nil {
		return err
	}

	return poll("back in maintenance", waitFor, func(ctx context.Context) error {
		again, err := maintenanceClient(endpoint)
		if err != nil {
			return err
		}
		defer again.Close() //nolint:errcheck

		_, err = again.Version(ctx)
		if status.Code(err) != codes.Unimplemented {
			return fmt.Errorf("want Unimplemented from maintenance mode, got %v", err)
		}

		return nil
	})
}

// upgradeK8sCalls makes the Talos calls of talosctl upgrade-k8s's pre-pull (the legacy
// MachineService.ImagePull into the CRI namespace) and of its manifest sync (the control plane's
// Manifest resources, listed and decoded as manifests.GetBootstrapManifests does).
func upgradeK8sCalls(c *client.Client, endpoint string) error {
	if err := preflightReads(c, endpoint); err != nil {
		return err
	}

	if err := step("pre-pull (ImagePull, CRI namespace)", func(ctx context.Context) error {
		//nolint:staticcheck // the legacy method is what talosctl upgrade-k8s uses
		return c.ImagePull(client.WithNode(ctx, endpoint), common.ContainerdNamespace_NS_CRI, "registry.k8s.io/kube-apiserver:v1.34.2")
	}); err != nil {
		return err
	}

	return step("bootstrap manifests (COSI list)", func(ctx context.Context) error {
		items, err := safe.StateList[*k8s.Manifest](client.WithNode(ctx, endpoint), c.COSI,
			resource.NewMetadata(k8s.ControlPlaneNamespaceName, k8s.ManifestType, "", resource.VersionUndefined))
		if err != nil {
			return err
		}

		kinds := []string{}

		for m := range items.All() {
			for _, o := range m.TypedSpec().Items {
				kinds = append(kinds, fmt.Sprintf("%v/%v", o.Object["kind"], o.Object["metadata"].(map[string]any)["name"]))
			}
		}

		if !slices.Contains(kinds, "ConfigMap/kubeconfig-in-cluster") {
			return fmt.Errorf("want the kubeconfig-in-cluster ConfigMap among the manifests, got %v", kinds)
		}

		fmt.Printf("   manifests %v\n", kinds)

		return nil
	})
}

// preflightReads reads what upgrade-k8s's pre-flight checks read (go-kubernetes upgrade.Checks):
// the control plane's StaticPod kube-apiserver (its first container's command) and the KubeletSpec.
func preflightReads(c *client.Client, endpoint string) error {
	return step("pre-flight reads (COSI StaticPod, KubeletSpec)", func(ctx context.Context) error {
		ctx = client.WithNode(ctx, endpoint)

		pod, err := safe.StateGet[*k8s.StaticPod](ctx, c.COSI, k8s.NewStaticPod(k8s.NamespaceName, k8s.APIServerID).Metadata())
		if err != nil {
			return err
		}

		spec, _ := pod.TypedSpec().Pod["spec"].(map[string]any)
		containers, _ := spec["containers"].([]any)

		if len(containers) == 0 {
			return fmt.Errorf("want a container in the kube-apiserver StaticPod, got %v", pod.TypedSpec().Pod)
		}

		command, _ := containers[0].(map[string]any)["command"].([]any)
		if len(command) < 2 || command[0] != "/usr/local/bin/kube-apiserver" {
			return fmt.Errorf("want the kube-apiserver command with args, got %v", command)
		}

		kubelet, err := safe.StateGet[*k8s.KubeletSpec](ctx, c.COSI, k8s.NewKubeletSpec(k8s.NamespaceName, k8s.KubeletID).Metadata())
		if err != nil {
			return err
		}

		if kubelet.TypedSpec().Image == "" || len(kubelet.TypedSpec().Args) == 0 {
			return fmt.Errorf("want the kubelet's image and args, got %+v", kubelet.TypedSpec())
		}

		fmt.Printf("   kube-apiserver %d args, kubelet %s %d args\n", len(command)-1, kubelet.TypedSpec().Image, len(kubelet.TypedSpec().Args))

		return nil
	})
}

// upgrade does what talosctl 1.13 upgrade does by default: pull the installer into the
// system namespace, LifecycleService.Upgrade (a stream ending in exit code 0), Reboot, then
// wait for a new boot id; and checks the node reports the installer's version afterwards.
func upgrade(c *client.Client, endpoint string, waitFor time.Duration) error {
	const image = "ghcr.io/siderolabs/installer:v1.13.1"

	containerd := &common.ContainerdInstance{Driver: common.ContainerDriver_CONTAINERD, Namespace: common.ContainerdNamespace_NS_SYSTEM}

	var bootID string

	readBootID := func(ctx context.Context) (string, error) {
		r, err := c.Read(client.WithNode(ctx, endpoint), "/proc/sys/kernel/random/boot_id")
		if err != nil {
			return "", err
		}
		defer r.Close() //nolint:errcheck

		data, err := io.ReadAll(r)

		return strings.TrimSpace(string(data)), err
	}

	if err := step("read boot id", func(ctx context.Context) error {
		var err error
		bootID, err = readBootID(ctx)
		if err == nil && bootID == "" {
			err = errors.New("empty boot id")
		}

		return err
	}); err != nil {
		return err
	}

	if err := step("image pull (installer)", func(ctx context.Context) error {
		stream, err := c.ImageClient.Pull(client.WithNode(ctx, endpoint), &machine.ImageServicePullRequest{Containerd: containerd, ImageRef: image})
		if err != nil {
			return err
		}

		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}

			if err != nil {
				return err
			}

			fmt.Printf("   pulled %s\n", msg.GetName())
		}
	}); err != nil {
		return err
	}

	if err := step("lifecycle upgrade", func(ctx context.Context) error {
		stream, err := c.LifecycleClient.Upgrade(client.WithNode(ctx, endpoint), &machine.LifecycleServiceUpgradeRequest{
			Containerd: containerd,
			Source:     &machine.InstallArtifactsSource{ImageName: image},
		})
		if err != nil {
			return err
		}

		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return errors.New("stream ended without an exit code")
			}

			if err != nil {
				return err
			}

			fmt.Printf("   %s\n", msg.GetProgress().Fmt())

			if exit, ok := msg.GetProgress().GetResponse().(*machine.LifecycleServiceInstallProgress_ExitCode); ok {
				if exit.ExitCode != 0 {
					return fmt.Errorf("exit code %d", exit.ExitCode)
				}

				return nil
			}
		}
	}); err != nil {
		return err
	}

	if err := step("reboot", func(ctx context.Context) error {
		resp, err := c.RebootWithResponse(client.WithNodes(ctx, endpoint))
		if err != nil {
			return err
		}

		if len(resp.Messages) != 1 || resp.Messages[0].ActorId == "" {
			return fmt.Errorf("unexpected reply %v", resp)
		}

		return nil
	}); err != nil {
		return err
	}

	return poll("back on v1.13.1 with a new boot id", waitFor, func(ctx context.Context) error {
		now, err := readBootID(ctx)
		if err != nil {
			return err
		}

		if now == bootID {
			return errors.New("boot id unchanged")
		}

		resp, err := c.Version(client.WithNodes(ctx, endpoint))
		if err != nil {
			return err
		}

		if tag := resp.Messages[0].Version.GetTag(); tag != "v1.13.1" {
			return fmt.Errorf("version %s, want v1.13.1", tag)
		}

		return nil
	})
}
