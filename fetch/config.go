package fetch

import "github.com/cryo-runtime/cryo/configs"

// OptionsFromConfig maps the node's [stores] section to Options; what the
// section leaves empty comes from the STORAGE_S3_* / STORAGE_MINIO_*
// environment when a store is opened.
func OptionsFromConfig(c configs.Stores) Options {
	o := Options{MaxConcurrent: c.MaxConcurrentFetches}
	s3 := S3Options{Endpoint: c.S3.Endpoint, AccessKeyID: c.S3.AccessKey, SecretAccessKey: c.S3.SecretKey, Region: c.S3.Region}
	if c.S3.Endpoint != "" {
		b := c.S3.UseSSL
		s3.UseSSL = &b
	}
	o.S3, o.MinIO = s3, s3
	o.Registry = RegistryOptions{PlainHTTPHosts: c.Registry.PlainHTTP, Username: c.Registry.Username, Password: c.Registry.Password}
	return o
}
