"""What is shown, read from the run's model (ddptui/state/): the Textual dashboard, the headless console."""
