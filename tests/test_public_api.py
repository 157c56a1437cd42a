import layerscope


def test_all_names_exist_and_are_public():
    for name in layerscope.__all__:
        assert hasattr(layerscope, name), name
    assert {"analyze", "summary", "activations", "Report", "LayerscopeError"} <= set(layerscope.__all__)
    assert all(issubclass(getattr(layerscope, n), layerscope.LayerscopeError)
               for n in ("InputError", "ForwardError", "SpecError", "RegistryError"))
