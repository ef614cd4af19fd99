"""``python -m kaizen_server_extension.credentials.keygen``: print a fresh KAIZEN_CREDENTIAL_KEY."""

from kaizen_server_extension.credentials.crypto import new_key_text

if __name__ == "__main__":
    print(new_key_text())
