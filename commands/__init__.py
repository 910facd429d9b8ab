"""The dphil command-line commands: one thin click module each."""
