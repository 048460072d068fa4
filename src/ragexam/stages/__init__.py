"""The stages that call an LLM: the runner, generate, answer and judge, and their dry runs."""
