# JAX allocates through XLA's BFC allocator, which takes 75% of the card at start through the
# driver's VMM API (cuMemAddressReserve / cuMemCreate / cuMemMap), reached by cuGetProcAddress.
import jax, jax.numpy as jnp
x = jnp.ones((256, 1024, 1024), dtype=jnp.float32)  # 1 GiB
print("JAX", float(x.sum()), jax.devices(), flush=True)
