"""Relief when memory or KV runs short: offloading, preemption and memory pressure."""
