"""Typed wire shapes of the HTTP APIs gnll serves: one module per API (pydantic request, response and
chunk models), as vLLM's ``protocol.py`` modules are. Serving classes build and read these, never raw
dicts."""
