/* The shim's per-thread state, in initial-exec thread-local storage.
 *
 * Rust's thread-locals in a cdylib use the general-dynamic TLS model: every access calls
 * __tls_get_addr. The shim is always loaded at start-up (LD_PRELOAD), so its thread-locals can
 * live in the static TLS block instead, reached from the thread pointer with no call; stable Rust
 * cannot ask for that model, C can. Nothing here has a destructor: the state is valid until the
 * thread is gone, including inside other libraries' thread-exit destructors. */
#include <stdint.h>

struct gpufrag_thread {
	uint32_t in_hook; /* inside one of the shim's wrappers */
	uint32_t tid;     /* 0 until the thread's first event */
	uint32_t lane;    /* its lane, with the exclusive bit */
	uint32_t pad;
	uint64_t limit;   /* how far it may push into an exclusive lane (Ring::push_single) */
};

static __thread struct gpufrag_thread state __attribute__((tls_model("initial-exec")));

__attribute__((visibility("hidden"))) struct gpufrag_thread *gpufrag_thread(void)
{
	return &state;
}
