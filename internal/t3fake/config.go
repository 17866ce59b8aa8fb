package t3fake

import (
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// descriptor is GET /.well-known/t3/environment and server.getConfig's environment. Protocol 2
// follows the synthetic gate fixture (released 0.1.0); protocol 1 is a 0.0.45 server, whose
// descriptor has no orchestrationProtocolVersion.
func (s *Server) descriptor() t3rpc.EnvironmentDescriptor {
	d := t3rpc.EnvironmentDescriptor{
		EnvironmentId: s.envID,
		Label:         s.opts.Label,
		Platform: t3rpc.NewOptEnvironmentDescriptorPlatform(t3rpc.EnvironmentDescriptorPlatform{
			Os: optStr("linux"), Arch: optStr("x64"),
		}),
	}
	yes := jx.Raw("true")
	if s.protocol.Load() == 2 {
		d.ServerVersion = "0.1.0"
		d.OrchestrationProtocolVersion = t3rpc.NewOptInt(2)
		d.Capabilities = t3rpc.NewOptEnvironmentDescriptorCapabilities(t3rpc.EnvironmentDescriptorCapabilities{
			"repositoryIdentity": yes, "connectionProbe": yes, "threadSettlement": yes,
			"threadSnooze": yes, "threadPinning": yes,
		})
	} else {
		d.ServerVersion = "0.0.45"
		d.Capabilities = t3rpc.NewOptEnvironmentDescriptorCapabilities(t3rpc.EnvironmentDescriptorCapabilities{
			"repositoryIdentity": yes,
		})
	}
	return d
}

// Provider instances of server.getConfig: one usable (codex, with option descriptors for the
// connector to validate model options against) and one disabled, as a real server lists installed
// but switched-off providers.
const (
	ProviderInstance = "codex"
	ProviderModel    = "gpt-5.6-sol"
)

func choice(id, label string, def bool) t3rpc.OptionChoice {
	c := t3rpc.OptionChoice{ID: id, Label: optStr(label)}
	if def {
		c.IsDefault = t3rpc.NewOptBool(true)
	}
	return c
}

func providers() []t3rpc.Provider {
	effort := t3rpc.OptionDescriptor{ID: "reasoningEffort", Label: optStr("Reasoning"), Type: "select", Options: []t3rpc.OptionChoice{
		choice("low", "Low", false), choice("medium", "Medium", false), choice("high", "High", true),
	}}
	tier := t3rpc.OptionDescriptor{ID: "serviceTier", Label: optStr("Speed"), Type: "select", Options: []t3rpc.OptionChoice{
		choice("default", "Standard", true), choice("fast", "Fast", false),
	}}
	model := func(slug, name string, ds ...t3rpc.OptionDescriptor) t3rpc.ProviderModel {
		return t3rpc.ProviderModel{
			Slug: slug, Name: optStr(name),
			Capabilities: t3rpc.NewOptProviderModelCapabilities(t3rpc.ProviderModelCapabilities{OptionDescriptors: ds}),
		}
	}
	return []t3rpc.Provider{
		{
			InstanceId: "claudeAgent", Driver: optStr("claudeAgent"), DisplayName: optStr("Claude"),
			Enabled: t3rpc.NewOptBool(false), Installed: t3rpc.NewOptBool(false), Status: optStr("disabled"),
			Message: optStr("Claude is disabled in T3 Code settings."),
			Models: []t3rpc.ProviderModel{
				model("claude-opus-5", "Claude Opus 5",
					t3rpc.OptionDescriptor{ID: "effort", Label: optStr("Reasoning"), Type: "select", Options: []t3rpc.OptionChoice{
						choice("low", "Low", false), choice("medium", "Medium", false), choice("high", "High", true),
					}},
					t3rpc.OptionDescriptor{ID: "fastMode", Label: optStr("Fast Mode"), Type: "boolean"}),
			},
		},
		{
			InstanceId: ProviderInstance, Driver: optStr("codex"), DisplayName: optStr("Codex"),
			Enabled: t3rpc.NewOptBool(true), Installed: t3rpc.NewOptBool(true), Status: optStr("ready"),
			Models: []t3rpc.ProviderModel{
				model(ProviderModel, "GPT-5.6 Sol", effort, tier),
				model("gpt-5.6-mini", "GPT-5.6 Mini", effort),
			},
		},
	}
}

func (s *Server) serverConfig() t3rpc.ServerConfig {
	return t3rpc.ServerConfig{
		Environment: t3rpc.NewOptEnvironmentDescriptor(s.descriptor()),
		Cwd:         optStr(s.opts.Cwd),
		Providers:   providers(),
	}
}
