"""The three ways ``gnll serve`` streams an answer.

- :mod:`~gnll.serving.streams.live`: an in-process answer while it is decoded (token by token,
  holding back what may still be cut);
- :mod:`~gnll.serving.streams.replay`: a finished answer replayed as chunks;
- :mod:`~gnll.serving.streams.upstream`: a proxied upstream stream, reassembled choice by choice so
  that its log-probs can be read like a whole response's.
"""
