"""The stores: each module owns one store's layout, both reading and writing."""
