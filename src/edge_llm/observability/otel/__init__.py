"""OpenTelemetry export: settings (always importable), and the SDK, spans and GenAI
metrics, imported only when the settings say it is on."""
