// Command libcni_client drives CNI attachments through libcni itself, as a container runtime
// does: the conflist loaded from the conf dir by network name (or from a file), then
// AddNetworkList, CheckNetworkList or DelNetworkList on a CNIConfig that has a cache dir, with a
// RuntimeConf holding the container ID, netns, ifname, CNI_ARGS and capability args. It is
// built by the tests against the libcni a distribution ships (Debian: golang-github-appc-cni-dev)
// in GOPATH mode, without downloading anything.
//
// Usage:
//
//	libcni_client [flags] add|check|del|cached|parse CONTAINER_ID IFNAME
//
// It prints one JSON object on a line: {"ok":true,...} with the result of an add, or
// {"ok":false,"error":"<libcni's error string>"} with exit status 1. Usage errors exit 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
)

type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ":") }

func (d *dirList) Set(value string) error {
	if value == "" {
		return errors.New("empty dir")
	}
	*d = append(*d, value)
	return nil
}

type output struct {
	OK      bool            `json:"ok"`
	Command string          `json:"command"`
	Network string          `json:"network,omitempty"`
	Error   string          `json:"error,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Config  json.RawMessage `json:"config,omitempty"`
	Args    [][2]string     `json:"args,omitempty"`
	Caps    json.RawMessage `json:"capabilityArgs,omitempty"`
}

func usage(flags *flag.FlagSet) {
	fmt.Fprintf(flags.Output(), "usage: %s [flags] add|check|del|cached|parse CONTAINER_ID IFNAME\n", flags.Name())
	flags.PrintDefaults()
}

// parseArgs reads CNI_ARGS syntax (K=V;K=V) into libcni's RuntimeConf.Args.
func parseArgs(text string) ([][2]string, error) {
	var args [][2]string
	if text == "" {
		return nil, nil
	}
	for _, pair := range strings.Split(text, ";") {
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 || kv[0] == "" {
			return nil, fmt.Errorf("CNI_ARGS item %q is not KEY=VALUE", pair)
		}
		args = append(args, [2]string{kv[0], kv[1]})
	}
	return args, nil
}

func loadList(confDir, network, conflist string) (*libcni.NetworkConfigList, error) {
	switch {
	case conflist != "" && (confDir != "" || network != ""):
		return nil, errors.New("--conflist excludes --conf-dir and --network")
	case conflist != "":
		return libcni.ConfListFromFile(conflist)
	case confDir != "" && network != "":
		return libcni.LoadConfList(confDir, network)
	default:
		return nil, errors.New("give --conf-dir with --network, or --conflist")
	}
}

func run(command string, list *libcni.NetworkConfigList, cni *libcni.CNIConfig, rt *libcni.RuntimeConf, timeout time.Duration) output {
	out := output{Command: command, Network: list.Name}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var err error
	switch command {
	case "add":
		result, addErr := cni.AddNetworkList(ctx, list, rt)
		if err = addErr; err == nil {
			out.Result, err = json.Marshal(result)
		}
	case "check":
		err = cni.CheckNetworkList(ctx, list, rt)
	case "del":
		err = cni.DelNetworkList(ctx, list, rt)
	case "parse":
		// What libcni made of the config itself: the list's name and version, and each
		// plugin's fields as its types.NetConf decoded them.
		plugins := []map[string]interface{}{}
		for _, plugin := range list.Plugins {
			plugins = append(plugins, map[string]interface{}{
				"type":         plugin.Network.Type,
				"ipamType":     plugin.Network.IPAM.Type,
				"capabilities": plugin.Network.Capabilities,
			})
		}
		out.Result, err = json.Marshal(map[string]interface{}{
			"name":       list.Name,
			"cniVersion": list.CNIVersion,
			"plugins":    plugins,
		})
	case "cached":
		// What libcni reads back from its cache for this attachment: the cached result as a
		// DEL would get it, then the cached config and runtime arguments.
		result, resErr := cni.GetNetworkListCachedResult(list, rt)
		if err = resErr; err == nil && result != nil {
			out.Result, err = json.Marshal(result)
		}
		if err == nil {
			config, cachedRt, confErr := cni.GetNetworkListCachedConfig(list, rt)
			if err = confErr; err == nil && cachedRt != nil {
				out.Config = config
				out.Args = cachedRt.Args
				out.Caps, err = json.Marshal(cachedRt.CapabilityArgs)
			}
		}
	}
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.OK = true
	return out
}

func main() {
	flags := flag.NewFlagSet("libcni_client", flag.ContinueOnError)
	var binDirs dirList
	confDir := flags.String("conf-dir", "", "load the conflist named by --network from this dir, as a runtime does (libcni.LoadConfList)")
	network := flags.String("network", "", "the network name to load from --conf-dir")
	conflist := flags.String("conflist", "", "read the conflist from this file instead (libcni.ConfListFromFile)")
	flags.Var(&binDirs, "bin-dir", "a plugin dir; repeat for several, searched in order")
	cacheDir := flags.String("cache-dir", "", "libcni's cache dir (results/ under it); empty: libcni's default")
	netns := flags.String("netns", "", "the netns path (CNI_NETNS); empty, as after a reboot")
	cniArgs := flags.String("args", "", "CNI_ARGS, as KEY=VALUE;KEY=VALUE")
	capArgs := flags.String("capability-args", "", "capability args as a JSON object, e.g. {\"portMappings\":[...]}")
	timeout := flags.Duration("timeout", 60*time.Second, "deadline of the whole operation")
	flags.Usage = func() { usage(flags) }
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if flags.NArg() != 3 {
		usage(flags)
		os.Exit(2)
	}
	command, containerID, ifname := flags.Arg(0), flags.Arg(1), flags.Arg(2)
	switch command {
	case "add", "check", "del", "cached", "parse":
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", command)
		usage(flags)
		os.Exit(2)
	}
	args, err := parseArgs(*cniArgs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var caps map[string]interface{}
	if *capArgs != "" {
		if err := json.Unmarshal([]byte(*capArgs), &caps); err != nil {
			fmt.Fprintf(os.Stderr, "--capability-args: %v\n", err)
			os.Exit(2)
		}
	}

	var out output
	list, err := loadList(*confDir, *network, *conflist)
	if err != nil {
		out = output{Command: command, Error: err.Error()}
	} else {
		cni := libcni.NewCNIConfigWithCacheDir(binDirs, *cacheDir, nil)
		rt := &libcni.RuntimeConf{
			ContainerID:    containerID,
			NetNS:          *netns,
			IfName:         ifname,
			Args:           args,
			CapabilityArgs: caps,
		}
		out = run(command, list, cni, rt, *timeout)
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(string(line))
	if !out.OK {
		os.Exit(1)
	}
}
