"""Worker process entry point."""
