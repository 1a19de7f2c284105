// Command gpuguard-agent is gpuguard's node agent: NVML discovery, a kubelet
// device plugin that hands out GPUs through channels pods cannot forge, and
// a node hardening report. See docs/agent.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gpuguard/gpuguard/agent/app"
)

func main() {
	if err := command().Execute(); err != nil {
		os.Exit(1)
	}
}

func command() *cobra.Command {
	cfg := app.DefaultConfig()
	verbosity := 0
	cmd := &cobra.Command{
		Use:           "gpuguard-agent",
		Short:         "gpuguard node agent: NVIDIA GPU device plugin and node hardening report",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			zc := zap.NewProductionConfig()
			zc.Level = zap.NewAtomicLevelAt(zapcore.Level(-verbosity))
			zc.DisableStacktrace = true
			zc.EncoderConfig.TimeKey = "time"
			zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
			zl, err := zc.Build()
			if err != nil {
				return err
			}
			defer func() { _ = zl.Sync() }()
			log := zapr.NewLogger(zl)

			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			agent, err := app.New(cfg, log, reg)
			if err != nil {
				log.Error(err, "invalid configuration")
				fmt.Fprintln(os.Stderr, "gpuguard-agent:", err)
				return err
			}

			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
			defer stop()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			reload := make(chan struct{}, 1)
			go func() {
				for range hup {
					select {
					case reload <- struct{}{}:
					default:
					}
				}
			}()

			if cfg.MetricsAddr != "" {
				if _, err := agent.ServeHTTP(ctx, cfg.MetricsAddr, reg); err != nil {
					log.Error(err, "cannot serve metrics", "addr", cfg.MetricsAddr)
					return err
				}
			}
			err = agent.Run(ctx, reload)
			var cfgErr app.ConfigError
			if errors.As(err, &cfgErr) {
				fmt.Fprintln(os.Stderr, "gpuguard-agent:", err)
			}
			if err != nil {
				log.Error(err, "agent stopped")
			}
			return err
		},
	}
	cfg.AddFlags(cmd.Flags())
	cmd.Flags().IntVarP(&verbosity, "v", "v", 0, "log verbosity (1: per-device details)")
	return cmd
}
