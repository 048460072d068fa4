"""Read-only access to a Chroma store: open it, page through its chunks, never change it."""
