"""Where each VM sits: the fleet's topology as child -> parent edges by layer, each with its source and
validity (model), read from the operator's inventory, host agents, schedulers and the fabric."""
