# As jaxlib 0.11's JaxRuntimeError (jaxlib/jax.cc, register_runtime_error_bindings), re-exported
# as jax.errors.JaxRuntimeError: a RuntimeError whose __init__(msg=None, code=None) keeps the
# absl status code and the message, and whose str() is the message. jaxlib's C++ translator
# builds it as JaxRuntimeError(msg, code) when XLA returns an error status.


class JaxRuntimeError(RuntimeError):
    """Runtime errors thrown by the JAX runtime."""

    def __init__(self, msg=None, code=None):
        msg = msg if msg is not None else ""
        self._error_code = code if code is not None else 2  # absl::StatusCode::kUnknown
        self._error_message = msg
        RuntimeError.__init__(self, msg)

    def __str__(self):
        return self._error_message

    @property
    def error_code(self):
        return self._error_code

    @property
    def error_message(self):
        return self._error_message


JaxRuntimeError.__module__ = "jax.errors"
