// The cert-manager controller as the lab runs it: the upstream controllers with upstream's
// default configuration, overlaid by a ControllerConfiguration file (--config, as the chart
// mounts it) and a few upstream-named flags; out of cluster (a kubeconfig), without leader
// election (one process per cluster) and without the metrics, profiling and healthz
// listeners, which bind every interface (no kubelet or Prometheus probes them here).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"

	config "github.com/cert-manager/cert-manager/internal/apis/config/controller"
	configscheme "github.com/cert-manager/cert-manager/internal/apis/config/controller/scheme"
	defaults "github.com/cert-manager/cert-manager/internal/apis/config/controller/v1alpha1"
	"github.com/cert-manager/cert-manager/internal/controller/feature"
	configv1alpha1 "github.com/cert-manager/cert-manager/pkg/apis/config/controller/v1alpha1"
	"github.com/cert-manager/cert-manager/pkg/controller"
	shimgateway "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/gateways"
	controllerconfigfile "github.com/cert-manager/cert-manager/pkg/controller/configfile"
	dnsutil "github.com/cert-manager/cert-manager/pkg/issuer/acme/dns/util"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	"github.com/cert-manager/cert-manager/pkg/util/configfile"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	_ "github.com/cert-manager/cert-manager/pkg/controller/acmechallenges"
	_ "github.com/cert-manager/cert-manager/pkg/controller/acmeorders"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/gateways"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/ingresses"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/acme"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/vault"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/venafi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf.InitLogs()
	defer logf.FlushLogs()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	if err := run(ctx, os.Args[1:]); err != nil {
		logf.Log.Error(err, "cert-manager controller stopped")
		logf.FlushLogs()
		os.Exit(1)
	}
}

// upstreamDefaults is the controller configuration cert-manager's own program starts from.
func upstreamDefaults() (*config.ControllerConfiguration, error) {
	scheme, _, err := configscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	versioned := &configv1alpha1.ControllerConfiguration{}
	scheme.Default(versioned)
	cfg := &config.ControllerConfiguration{}
	return cfg, scheme.Convert(versioned, cfg, nil)
}

func run(ctx context.Context, args []string) error {
	cfg, err := upstreamDefaults()
	if err != nil {
		return err
	}
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	version := fs.Bool("version", false, "print the cert-manager version and exit")
	configFile := fs.String("config", "", "a ControllerConfiguration file (the chart's controller ConfigMap)")
	fs.StringVar(&cfg.KubeConfig, "kubeconfig", "", "kubeconfig of the cluster to manage")
	fs.StringVar(&cfg.ClusterResourceNamespace, "cluster-resource-namespace", cfg.ClusterResourceNamespace, "namespace of ClusterIssuer secrets")
	fs.BoolVar(&cfg.EnableGatewayAPI, "enable-gateway-api", cfg.EnableGatewayAPI, "Gateway API support (gateway-shim, HTTPRoute HTTP-01 solver)")
	fs.StringSliceVar(&cfg.ACMEHTTP01Config.SolverNameservers, "acme-http01-solver-nameservers", nil, "nameservers (host:port) for the HTTP-01 self check")
	fs.StringSliceVar(&cfg.ACMEDNS01Config.RecursiveNameservers, "dns01-recursive-nameservers", nil, "nameservers (host:port) for DNS-01 checks")
	logf.AddFlags(&cfg.Logging, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *configFile != "" { // the file under the flags, as upstream: parse the flags again over it
		loader, err := configfile.NewConfigurationFSLoader(nil, *configFile)
		if err != nil {
			return err
		}
		fromFile := controllerconfigfile.New()
		if err := loader.Load(fromFile); err != nil {
			return fmt.Errorf("config file %s: %w", *configFile, err)
		}
		fromFile.Config.DeepCopyInto(cfg)
		if err := fs.Parse(args); err != nil {
			return err
		}
	}
	if *version {
		fmt.Println(util.VersionInfo().GitVersion)
		return nil
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates); err != nil {
		return fmt.Errorf("feature gates: %w", err)
	}
	if err := logf.ValidateAndApply(&cfg.Logging); err != nil {
		return err
	}
	log := logf.FromContext(ctx)
	log.Info("starting cert-manager controller", "version", util.VersionInfo().GitVersion)

	factory, err := contextFactory(ctx, cfg)
	if err != nil {
		return err
	}
	base, err := factory.Build()
	if err != nil {
		return err
	}
	enabled := sets.New(defaults.DefaultEnabledControllers...)
	gatewayAPI := cfg.EnableGatewayAPI && utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalGatewayAPISupport)
	if gatewayAPI {
		enabled.Insert(shimgateway.ControllerName)
	}
	g, ctx := errgroup.WithContext(ctx)
	for name, constructor := range controller.Known() {
		if !enabled.Has(name) {
			continue
		}
		c, err := constructor(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		g.Go(func() error { return c.Run(cfg.NumberOfConcurrentWorkers, ctx) })
	}
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	if gatewayAPI {
		base.GWShared.Start(ctx.Done())
	}
	return g.Wait()
}

func contextFactory(ctx context.Context, cfg *config.ControllerConfiguration) (*controller.ContextFactory, error) {
	quantity := func(s string) resource.Quantity { return resource.MustParse(s) }
	nameservers := cfg.ACMEDNS01Config.RecursiveNameservers
	if len(nameservers) == 0 {
		nameservers = dnsutil.RecursiveNameservers
	}
	h := cfg.ACMEHTTP01Config
	return controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         cfg.KubeConfig,
		KubernetesAPIQPS:   cfg.KubernetesAPIQPS,
		KubernetesAPIBurst: cfg.KubernetesAPIBurst,
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverResourceRequestCPU:    quantity(h.SolverResourceRequestCPU),
			HTTP01SolverResourceRequestMemory: quantity(h.SolverResourceRequestMemory),
			HTTP01SolverResourceLimitsCPU:     quantity(h.SolverResourceLimitsCPU),
			HTTP01SolverResourceLimitsMemory:  quantity(h.SolverResourceLimitsMemory),
			ACMEHTTP01SolverRunAsNonRoot:      h.SolverRunAsNonRoot,
			HTTP01SolverImage:                 h.SolverImage,
			HTTP01SolverNameservers:           h.SolverNameservers,
			DNS01Nameservers:                  nameservers,
			DNS01CheckRetryPeriod:             cfg.ACMEDNS01Config.CheckRetryPeriod,
			DNS01CheckAuthoritative:           !cfg.ACMEDNS01Config.RecursiveNameserversOnly,
		},
		SchedulerOptions: controller.SchedulerOptions{MaxConcurrentChallenges: cfg.MaxConcurrentChallenges},
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: cfg.ClusterResourceNamespace,
		},
		IngressShimOptions: controller.IngressShimOptions{
			DefaultAutoCertificateAnnotations: cfg.IngressShimConfig.DefaultAutoCertificateAnnotations,
		},
		ConfigOptions: controller.ConfigOptions{EnableGatewayAPI: cfg.EnableGatewayAPI},
	})
}
