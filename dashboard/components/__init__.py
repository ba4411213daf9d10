"""One module per dashboard page; each defines a ``Page`` subclass (see ``common``)."""
