"""What is shown, read from the run's model (ddptui/contract/state/): the Textual dashboard, its
widgets and screens, the headless console. Loaded in a dashboard's process."""
