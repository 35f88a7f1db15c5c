"""The rank-side kit: what runs inside a rank for every kind of run (the built-in loop, your
script with ddptui.init(), the callbacks, a wrapped rank): telemetry, the elastic world, the
prefetcher, the sharded sampler and the private APIs of torch it relies on (compat)."""
