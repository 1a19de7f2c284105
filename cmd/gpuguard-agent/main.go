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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/gpuguard/gpuguard/agent/app"
	"github.com/gpuguard/gpuguard/internal/logging"
)

func main() {
	if err := command().Execute(); err != nil {
		os.Exit(1)
	}
}

func command() *cobra.Command {
	cfg := app.DefaultConfig()
	var logOpts logging.Options
	verbosity := 0
	cmd := &cobra.Command{
		Use:           "gpuguard-agent",
		Short:         "gpuguard node agent: NVIDIA GPU device plugin and node hardening report",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verbosity > 0 {
				logOpts.Level = "debug" // the deprecated -v
			}
			log, err := logOpts.Build()
			if err != nil {
				fmt.Fprintln(os.Stderr, "gpuguard-agent:", err)
				return err
			}
			logging.Install(log)

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
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().IntVarP(&verbosity, "v", "v", 0, "log verbosity; 1 is --log-level=debug")
	_ = cmd.Flags().MarkDeprecated("v", "use --log-level=debug")
	return cmd
}
