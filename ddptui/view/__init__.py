"""What is shown: the run state folded from events, the Textual dashboard, the headless console."""
