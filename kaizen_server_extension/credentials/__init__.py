"""Credential quarantine (docs/credentials.md): the model never sees a credential.

``policy/credential_arguments.py`` refuses credential-shaped tool arguments before execution
(R-349); ``destinations`` says
where a credential may go; ``crypto`` derives the deployment's keys, signs form plans and seals
remembered values; ``forms`` is the signed, expiring, one-shot browser form; ``broker`` holds
values and turns an opaque ``credential_ref`` into exactly one bounded request;
``service`` wires them for the server.
"""
