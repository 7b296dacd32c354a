"""Running code right after a module finishes importing, without importing it: the hook never
imports torch, jax or cupy itself, it waits for the program to."""

import sys


def after_import(name, then):
    """Calls then(module) as soon as module `name` has finished importing (at once if it has)."""
    if name in sys.modules:
        then(sys.modules[name])
        return

    class _Finder:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != name:
                return None
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                try:
                    then(module)
                except Exception:
                    pass

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
