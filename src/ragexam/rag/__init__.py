"""The RAG systems under test: one base, the built-in chain, the control answerers and yours."""
