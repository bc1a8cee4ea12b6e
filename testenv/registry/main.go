// Command registry is the test world's OCI registry and image builder, on go-containerregistry.
//
//	registry build --layout DIR --name REF --layer TAR [--entrypoint A,B] [--cmd A,B] [--user U]
//	               [--workdir D] [--env K=V]...
//	    adds one linux image (one layer, the given config) to the OCI layout DIR under the name REF
//	registry serve --address HOST:PORT --layout DIR [--layout DIR]... [--blobs DIR]
//	    serves go-containerregistry's registry on HOST:PORT, loaded with every image of each DIR
//	    under its name, and prints "ready" once they are all there
//
// An image named registry.k8s.io/pause:3.10.2 is stored as the repository registry.k8s.io/pause,
// so the name stays whole. containerd, told by hosts.toml to use this registry as a mirror, asks
// for /v2/pause/manifests/3.10.2?ns=registry.k8s.io; the handler puts the ns query back in front
// of the path. A push straight to HOST:PORT/repo:tag (no ns) is stored as repo, as anywhere.
//
// Ours because no registry served by the module proxy names images by their upstream host, and
// the images themselves are built from binaries we build or Debian ships, not pulled.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const refAnnotation = "org.opencontainers.image.ref.name"

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	log.SetFlags(0)
	log.SetPrefix("registry: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: registry build|serve [flags] (see the source's comment)")
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "serve":
		err = serve(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or serve", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	dir := fs.String("layout", "", "OCI layout folder (created if missing)")
	ref := fs.String("name", "", "the image's full name, host/repo:tag")
	layerPath := fs.String("layer", "", "the image's one layer, a tar file")
	entrypoint := fs.String("entrypoint", "", "comma-separated entrypoint")
	cmd := fs.String("cmd", "", "comma-separated command")
	user := fs.String("user", "", "user[:group]")
	workdir := fs.String("workdir", "", "working directory")
	var env list
	fs.Var(&env, "env", "K=V, repeatable")
	_ = fs.Parse(args)
	if *dir == "" || *ref == "" || *layerPath == "" {
		return fmt.Errorf("build needs --layout, --name and --layer")
	}
	if _, err := name.ParseReference(*ref, name.StrictValidation); err != nil {
		return fmt.Errorf("--name %q: %w (give host/repository:tag)", *ref, err)
	}
	layer, err := tarball.LayerFromFile(*layerPath)
	if err != nil {
		return fmt.Errorf("layer %s: %w", *layerPath, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Config.Entrypoint = split(*entrypoint)
	cf.Config.Cmd = split(*cmd)
	cf.Config.User = *user
	cf.Config.WorkingDir = *workdir
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	p, err := layout.FromPath(*dir)
	if err != nil {
		if p, err = layout.Write(*dir, empty.Index); err != nil {
			return err
		}
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{refAnnotation: *ref}))
}

// withNamespace puts a mirror request's ns query (the upstream host) in front of its repository.
func withNamespace(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ns := r.URL.Query().Get("ns"); ns != "" && strings.HasPrefix(r.URL.Path, "/v2/") {
			r.URL.Path = "/v2/" + ns + "/" + strings.TrimPrefix(r.URL.Path, "/v2/")
		}
		h.ServeHTTP(w, r)
	})
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	address := fs.String("address", "127.0.0.1:0", "where to listen")
	var dirs list
	fs.Var(&dirs, "layout", "OCI layout whose images are loaded at start (repeatable)")
	blobs := fs.String("blobs", "", "keep blobs in this folder instead of memory")
	_ = fs.Parse(args)
	opts := []registry.Option{registry.Logger(log.New(os.Stderr, "registry: ", 0))}
	if *blobs != "" {
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(*blobs)))
	}
	ln, err := net.Listen("tcp", *address)
	if err != nil {
		return err
	}
	go func() { log.Fatal(http.Serve(ln, withNamespace(registry.New(opts...)))) }()
	host := ln.Addr().String()
	for _, dir := range dirs {
		n, err := load(dir, host)
		if err != nil {
			return err
		}
		log.Printf("loaded %d images from %s", n, dir)
	}
	fmt.Printf("ready %s\n", host)
	select {}
}

// load pushes every image of the layout to this registry under its full name.
func load(dir, host string) (int, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return 0, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return 0, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return 0, err
	}
	for _, d := range m.Manifests {
		full := d.Annotations[refAnnotation]
		ref, err := name.ParseReference(full, name.StrictValidation)
		if err != nil {
			return 0, fmt.Errorf("image %s in %s: %w", d.Digest, dir, err)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return 0, err
		}
		upstream := ref.Context().RegistryStr()
		if upstream == name.DefaultRegistry {
			// What containerd sends as ns for Docker Hub's images.
			upstream = "docker.io"
		}
		local, err := name.ParseReference(
			host+"/"+upstream+"/"+ref.Context().RepositoryStr()+":"+ref.Identifier(),
			name.Insecure)
		if err != nil {
			return 0, err
		}
		if err := remote.Write(local, img); err != nil {
			return 0, fmt.Errorf("loading %s: %w", full, err)
		}
	}
	return len(m.Manifests), nil
}
