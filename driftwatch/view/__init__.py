"""What a person sees in the terminal: the live view, the plain line, the summary."""
