// Package logging is the one logging setup of both gpuguard binaries: zap
// behind logr, the same flags (--log-format, --log-level), the same ISO 8601
// timestamps, and client-go's klog and controller-runtime routed through it,
// so that every line of a process is one JSON object of one shape.
package logging

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Options are the logging flags.
type Options struct {
	// Format is json (one object per line) or console.
	Format string
	// Level is debug, info or error; debug shows logr's V(1) lines.
	Level string
}

// AddFlags binds --log-format and --log-level.
func (o *Options) AddFlags(fl *pflag.FlagSet) {
	if o.Format == "" {
		o.Format = "json"
	}
	if o.Level == "" {
		o.Level = "info"
	}
	fl.StringVar(&o.Format, "log-format", o.Format, "json or console")
	fl.StringVar(&o.Level, "log-level", o.Level, "debug, info or error (debug adds per-object details)")
}

// Build makes the logger, writing to stderr or to outputPaths. It is never
// sampled: a webhook decision or an agent finding is a record, one line
// each, however many come in a second. (controller-runtime's own zap
// options sample in production mode, which is why zap is configured here.)
func (o Options) Build(outputPaths ...string) (logr.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.Set(o.Level); err != nil || (lvl != zapcore.DebugLevel && lvl != zapcore.InfoLevel && lvl != zapcore.ErrorLevel) {
		return logr.Discard(), fmt.Errorf("--log-level %q: use debug, info or error", o.Level)
	}
	cfg := zap.NewProductionConfig()
	switch o.Format {
	case "json":
	case "console":
		cfg = zap.NewDevelopmentConfig()
	default:
		return logr.Discard(), fmt.Errorf("--log-format %q: use json or console", o.Format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = true
	cfg.Sampling = nil
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	if len(outputPaths) > 0 {
		cfg.OutputPaths = outputPaths
	}
	z, err := cfg.Build()
	if err != nil {
		return logr.Discard(), err
	}
	return zapr.NewLogger(z), nil
}

// Install makes log the logger of controller-runtime and of klog, which
// client-go and the API machinery write through.
func Install(log logr.Logger) {
	crlog.SetLogger(log)
	klog.SetLogger(log)
}
