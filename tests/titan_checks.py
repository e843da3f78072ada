"""Shared by the torchtitan launch tests: write a plan's torchtitan files and let torchtitan 0.3 parse them."""

from planner.check import check_torchtitan
from planner.emit.torchtitan import torchtitan_config_name


def parsed_by_torchtitan(p, folder) -> dict:
    """Write `p`'s torchtitan launch files to `folder`, run planner's torchtitan check on them (its ConfigManager,
    model build on the meta device, meshes in a fake process group) and return what it read back."""
    files = p.to_torchtitan()
    files.write(folder)
    module, config = torchtitan_config_name(p)
    res = check_torchtitan(list(files.args), p.num_gpus, module=module, config=config, folder=str(folder),
                           num_layers=p.model.num_layers)
    assert res.ok, res.line()
    return res.details
