"""One callback per training framework, each built on ddptui.init(): Lightning
(ddptui.rank.integrations.lightning) and the Hugging Face Trainer (ddptui.rank.integrations.transformers).
Each imports its framework only when it is imported itself.
"""
