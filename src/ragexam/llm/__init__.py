"""Calls to an OpenAI-compatible endpoint: client, transport, pacing, structured output, prices."""
