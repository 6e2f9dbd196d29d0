// bolt_writer writes a bbolt database with the real bbolt (Debian's golang-github-coreos-bbolt-dev),
// so that the Python reader is tested against the format as bbolt writes it.
//
// Usage: bolt_writer DB < program.json
//
// The program is a JSON object: page_size (0: bbolt's default), no_freelist_sync (as containerd
// opens its meta.db), transactions, each a list of operations committed together, and churn,
// transactions a running containerd would commit: when there are any, the writer says
// "committed" on its standard output once the transactions are, then keeps the database open
// (and its lock) and commits the churn's transactions in turn, over and over, until its standard
// input ends. Every
// operation names a bucket path (a list of keys; empty is the top level); keys and values are
// base64, as encoding/json reads []byte:
//
//	{"op": "bucket", "path": [...]}                   make the buckets along path
//	{"op": "put", "path": [...], "key": k, "value": v} put k=v in the bucket at path (made as needed)
//	{"op": "delete", "path": [...], "key": k}          delete key k
//	{"op": "delete_bucket", "path": [...], "key": k}   delete the nested bucket k
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

type operation struct {
	Op    string   `json:"op"`
	Path  [][]byte `json:"path"`
	Key   []byte   `json:"key"`
	Value []byte   `json:"value"`
}

type program struct {
	PageSize       int           `json:"page_size"`
	NoFreelistSync bool          `json:"no_freelist_sync"`
	Transactions   [][]operation `json:"transactions"`
	Churn          [][]operation `json:"churn"`
}

// bucketsAlong makes (or opens) each bucket of path; nil means the top level.
func bucketsAlong(tx *bolt.Tx, path [][]byte) (*bolt.Bucket, error) {
	var bucket *bolt.Bucket
	for _, name := range path {
		var err error
		if bucket == nil {
			bucket, err = tx.CreateBucketIfNotExists(name)
		} else {
			bucket, err = bucket.CreateBucketIfNotExists(name)
		}
		if err != nil {
			return nil, fmt.Errorf("bucket %q: %w", name, err)
		}
	}
	return bucket, nil
}

func apply(tx *bolt.Tx, op operation) error {
	bucket, err := bucketsAlong(tx, op.Path)
	if err != nil {
		return err
	}
	switch op.Op {
	case "bucket":
		return nil
	case "put":
		if bucket == nil {
			return fmt.Errorf("put needs a bucket path")
		}
		return bucket.Put(op.Key, op.Value)
	case "delete":
		if bucket == nil {
			return fmt.Errorf("delete needs a bucket path")
		}
		return bucket.Delete(op.Key)
	case "delete_bucket":
		if bucket == nil {
			return tx.DeleteBucket(op.Key)
		}
		return bucket.DeleteBucket(op.Key)
	}
	return fmt.Errorf("unknown operation %q", op.Op)
}

func commit(db *bolt.DB, ops []operation) error {
	return db.Update(func(tx *bolt.Tx) error {
		for _, op := range ops {
			if err := apply(tx, op); err != nil {
				return err
			}
		}
		return nil
	})
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: bolt_writer DB < program.json")
		os.Exit(2)
	}
	var prog program
	decoder := json.NewDecoder(os.Stdin)
	if err := decoder.Decode(&prog); err != nil {
		fmt.Fprintln(os.Stderr, "program:", err)
		os.Exit(2)
	}
	options := &bolt.Options{PageSize: prog.PageSize, NoFreelistSync: prog.NoFreelistSync}
	db, err := bolt.Open(os.Args[1], 0o600, options)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(1)
	}
	for i, ops := range prog.Transactions {
		if err := commit(db, ops); err != nil {
			fmt.Fprintf(os.Stderr, "transaction %d: %v\n", i, err)
			os.Exit(1)
		}
	}
	if len(prog.Churn) > 0 {
		ended := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, io.MultiReader(decoder.Buffered(), os.Stdin))
			close(ended)
		}()
		fmt.Println("committed")
	churn:
		for n := 0; ; n++ {
			select {
			case <-ended:
				fmt.Fprintf(os.Stderr, "%d churn commits\n", n)
				break churn
			default:
			}
			if err := commit(db, prog.Churn[n%len(prog.Churn)]); err != nil {
				fmt.Fprintf(os.Stderr, "churn %d: %v\n", n, err)
				os.Exit(1)
			}
		}
	}
	if err := db.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		os.Exit(1)
	}
}
