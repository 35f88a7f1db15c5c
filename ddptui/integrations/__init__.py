"""The framework callbacks by the names users type: `from ddptui.integrations.lightning import
DdptuiCallback` (and .transformers, .keras). Each imports its framework when it is imported."""
