class JaxRuntimeError(RuntimeError):
    """As jax.errors.JaxRuntimeError (XLA's runtime errors, RESOURCE_EXHAUSTED among them)."""
