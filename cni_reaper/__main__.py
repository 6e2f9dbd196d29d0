from cni_reaper.command import console

console()
