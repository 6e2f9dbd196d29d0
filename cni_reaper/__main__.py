from cni_reaper.cli import console

console()
