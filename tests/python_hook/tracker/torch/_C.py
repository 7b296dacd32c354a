_GLIBCXX_USE_CXX11_ABI = True
observers = []


def _cuda_attach_out_of_memory_observer(fn):
    observers.append(fn)
