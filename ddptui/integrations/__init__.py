"""One callback per training framework, each built on ddptui.init(): Lightning
(ddptui.integrations.lightning). Each imports its framework only when it is imported itself.
"""
