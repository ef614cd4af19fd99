"""The vocabulary both sides of the trusted/untrusted boundary share.

The untrusted turn controller (``runtime/``) and the trusted backend (``host/``, ``tools/``,
``policy/``, ``store/``) both import this package, and it imports nothing of theirs: only the
standard library. ``tests/test_boundaries.py`` holds it to that.

- :mod:`.authority`: the authority bundle and its one comparison;
- :mod:`.tools`: capabilities, tool-call requests and results;
- :mod:`.model`: model-step context, streamed events, provider failures;
- :mod:`.errors`: errors whose message is safe to show to a member or a model.
"""
