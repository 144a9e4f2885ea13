// The cert-manager webhook as the lab runs it: upstream's configuration type and flags, and
// the admission chain and serving certificate upstream's server builds, served by a
// controller-runtime webhook server on one given address (--listen-host, ours) instead of
// every interface: the lab binds only loopback addresses it owns, and one webhook runs per
// emulated cluster on the address of the node its kwok-played pod runs on. The healthz
// listener (which binds every interface) is left out: no kubelet probes it here.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	ciphers "k8s.io/component-base/cli/flag"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	cmadmission "github.com/cert-manager/cert-manager/pkg/webhook/admission"
	"github.com/cert-manager/cert-manager/pkg/webhook/options"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log)
	ctx = logf.NewContext(ctx, logf.Log, "webhook")
	if err := run(ctx, os.Args[1:]); err != nil {
		logf.Log.Error(err, "cert-manager webhook stopped")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg, err := options.NewWebhookConfiguration()
	if err != nil {
		return err
	}
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	version := fs.Bool("version", false, "print the cert-manager version and exit")
	host := fs.String("listen-host", "127.0.0.1", "address to serve the webhook on")
	options.AddConfigFlags(fs, cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(util.VersionInfo().GitVersion)
		return nil
	}
	if err := logf.ValidateAndApply(&cfg.Logging); err != nil {
		return err
	}
	log := logf.FromContext(ctx)
	log.Info("starting cert-manager webhook", "version", util.VersionInfo().GitVersion, "address", fmt.Sprintf("%s:%d", *host, cfg.SecurePort))
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		return err
	}
	suites, err := ciphers.TLSCipherSuites(srv.CipherSuites)
	if err != nil {
		return err
	}
	minVersion, err := ciphers.TLSVersion(srv.MinTLSVersion)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(
		&rest.Config{}, // as upstream: the webhook server itself never calls the API server
		ctrl.Options{
			Scheme:         srv.ResourceScheme,
			Logger:         log,
			LeaderElection: false,
			Metrics:        metricsserver.Options{BindAddress: "0"}, // no metrics listener
			WebhookServer: webhook.NewServer(webhook.Options{
				Host: *host,
				Port: int(cfg.SecurePort),
				TLSOpts: []func(*tls.Config){func(c *tls.Config) {
					c.CipherSuites = suites
					c.MinVersion = minVersion
					c.GetCertificate = srv.CertificateSource.GetCertificate
				}},
			}),
		})
	if err != nil {
		return fmt.Errorf("error creating manager: %w", err)
	}
	if err := mgr.Add(srv.CertificateSource); err != nil {
		return err
	}
	mgr.GetWebhookServer().Register("/mutate", cmadmission.NewCustomMutationWebhook(srv.MutationWebhook))
	mgr.GetWebhookServer().Register("/validate", cmadmission.NewCustomValidationWebhook(mgr.GetScheme(), srv.ValidationWebhook))
	return mgr.Start(ctx)
}
