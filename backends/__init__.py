"""Built-in OpenEngine backend drivers (``openengine_backends.<name>``)."""
