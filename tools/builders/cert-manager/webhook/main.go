// The cert-manager webhook as the lab runs it: upstream's configuration type, flags and
// server (validation, mutation, conversion), out of cluster with a kubeconfig.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"

	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
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
	log.Info("starting cert-manager webhook", "version", util.VersionInfo().GitVersion)
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
